"""The engine core and how it runs: one model step at a time (`schedule -> execute -> update`), in
a thread or a process of its own, and the messages of its boundary.
"""
