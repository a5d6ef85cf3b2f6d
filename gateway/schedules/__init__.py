"""Scheduled prompts: the runner that fires them, their confirmation, and times in words."""
