"""Analysis of trained models: tools that read a model's attention, not part of its forward pass.

`primal_jax.analysis.spectrum`: the singular value spectrum of every layer's attention matrix (softmax) or
induced asymmetric kernel (Primal), as in the paper's Figure 1 (`python -m experiments.spectrum` runs it).
"""
