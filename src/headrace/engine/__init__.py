"""The engine: scheduler, block manager, model runner and the step loop."""
