"""Draft algorithms: one `DraftAlgorithm` record per algorithm bundles its config, module, drafter, training loss,
export writers and ONNX graphs, and every layer looks the record up by name instead of keeping a table of its own.

    from deepspec.algorithms import load_part, resolve_algorithm

    algorithm = resolve_algorithm(cfg.algo)        # KeyError naming the registered ones
    drafter = load_part(algorithm.drafter)(model)

It sits below the model layer and imports nothing of the library or the stages: the built-in records
(builtin.py: Eagle3, DFlash, DSpark) name their parts by import path and each layer loads the part it uses. Adding
an algorithm is writing its parts and one `register_algorithm(DraftAlgorithm(...))`; the toy algorithm of
tests/deepspec/algorithms/ is registered from the tests folder alone and trained, evaluated, served and exported.
"""

from deepspec.algorithms.algorithm import DraftAlgorithm, OnnxGraphs, Part, load_part
from deepspec.algorithms.registry import available_algorithms, check_layout, register_algorithm, resolve_algorithm

__all__ = [
    "DraftAlgorithm",
    "OnnxGraphs",
    "Part",
    "available_algorithms",
    "check_layout",
    "load_part",
    "register_algorithm",
    "resolve_algorithm",
]
