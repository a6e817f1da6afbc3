"""mimo-jobs: scaling studies of heterogeneous multimodal (MIMO) training.

Importing the package must stay cheap: no torch, megatron or energon here (the CLI runs on login nodes).
"""

__version__ = "0.1.0"
