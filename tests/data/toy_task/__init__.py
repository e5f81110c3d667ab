"""A toy fourth task: one directory, copied into src/grassflow/toy/ by
tests/pipeline/test_tasks.py."""
