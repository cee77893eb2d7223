"""Data loading for the paper's experiments, kept free of JAX so it runs anywhere numpy does.

`ts_format` parses the sktime/UEA `.ts` files of the UEA multivariate time-series
classification archive (the paper's Table 1); `aeon_wheel` obtains the few of
those files that ship inside the `aeon` wheel on PyPI (JapaneseVowels,
BasicMotions), so the default experiment needs no download beyond the package
registry.
"""
