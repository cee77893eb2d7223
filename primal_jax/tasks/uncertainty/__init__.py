"""Uncertainty of ViT classifiers (issue 56): KEP-SVGP attention against softmax baselines with maximum softmax
probability, temperature scaling, MC dropout and deep ensembles, and Primal.+ViT.

`config.py` trains each model through the one trainer (the vision family's `images` task, read by name);
`corruptions.py` (seeded image corruptions at five severities, code not data), `ood.py` (the 8 x 8 digits of
scikit-learn, from Debian's package, as out-of-distribution images), `calibration.py` (temperature scaling) and
`evaluation.py` (failure prediction, calibration, shift and OOD metrics of one trained model or an ensemble).
"""
