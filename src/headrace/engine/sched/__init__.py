"""Scheduling: which requests run in a step, with how many tokens (queues, fair share, budgets,
preemption, speculation drafts, stop checks).
"""
