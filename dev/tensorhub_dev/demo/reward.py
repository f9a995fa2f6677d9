"""The verifiable reward of the main job's toy task (verl loads this file by path: keep it import-free).

``compute_score`` follows verl's custom reward signature. The task asks for an answer in digits; the score
is the fraction of the response's non-space characters that are digits (0 for an empty response).
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_):
    chars = [c for c in solution_str if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c.isdigit() for c in chars) / len(chars)
