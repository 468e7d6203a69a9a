"""Evaluation protocols and the pieces around them that are not Lightning callbacks (those live in
``callbacks/``): the modality-free core (ranking, AUC conventions, perturbation, torchmetrics states, the
classifier wrappers, result keys and reporting) and what is per modality (perturbers, pixel maps, segmentation and
CDAM measures, the word layer ``words/`` with a decoder's generation attributions, ERASER's rationales). Each
module's docstring says what it holds; ``docs/architecture.md`` places the package among the others.
"""
