"""Build and train one model: configs, parameter budgets, the Flax transformer, data, the trainer.

Importing the package changes nothing process-wide; the command lines prepare the process (``entry.py``).
"""
