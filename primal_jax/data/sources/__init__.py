"""Places data comes from, one module each, every file pinned by SHA-256 where it is downloaded.

Modules::

  debian         files inside Debian packages; `fashion_mnist`: Fashion-MNIST from Debian's package
  pypi_wheel     members of a wheel on PyPI (`pip download`); `gensim_enwiki`: Wikipedia XML from gensim's wheel
  tfds_catalog   TFDS catalog datasets read as ArrayRecord without TensorFlow

A source that serves one family only and needs its format lives in that family (`tasks.uea.aeon_wheel`).
"""
