"""grassflow: a reproduction of "Attention Is Not What You Need: Grassmann Flows as an
Attention-Free Alternative for Sequence Modeling" (arXiv 2512.19428)."""

__version__ = "0.1.0"
