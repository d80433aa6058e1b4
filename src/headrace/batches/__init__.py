"""OpenAI's Batch API: uploaded files, batch jobs kept on disk, and the runner that feeds their
lines to the server's own routes on the batch tier."""
