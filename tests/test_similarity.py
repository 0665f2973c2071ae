"""The similarity section of the class report (issue 22 item 5): a planted copy is found with its shared lines, honest
answers written independently are not, nor are answers that coincide on a short exercise or across many hand-ins."""

import json

from instructor_class import HONEST, ONE, A

from grader.author.mutants import reference_submission
from grader.course import assignments
from grader.report.report import write_report
from grader.report.similarity import MIN_TOKENS, SHARE, K, compare, kgrams, template_grams, tokens, winnow
from labkit import cells

REFERENCE = {cells.grade_id(c): c.source for c in reference_submission(A).cells if cells.kind(c) == cells.ANSWER}

# One student's own writing of every exercise of notebook 01 …
ORIGINAL = {
    "mse_grad_answer": "def mse_grad(w, X, y):\n    residual = torch.matmul(X, w) - y\n"
                       "    scaled = residual.mul(2.0).div(len(y))\n    return torch.matmul(X.transpose(0, 1), scaled)\n",
    "numerical_grad_answer": "def numerical_grad(f, w, eps=1e-3):\n    flat = w.detach().reshape(-1).clone()\n"
                             "    out = torch.empty_like(flat)\n    for k in range(flat.shape[0]):\n"
                             "        up, down = flat.clone(), flat.clone()\n        up[k] += eps\n        down[k] -= eps\n"
                             "        hi = f(up.reshape(w.shape))\n        lo = f(down.reshape(w.shape))\n"
                             "        out[k] = (float(hi) - float(lo)) / (2 * eps)\n"
                             "    return out.reshape(w.shape)\n",
    "gradient_descent_answer": "def gradient_descent(w0, X, y, lr, steps):\n    current = w0.detach().clone()\n"
                               "    history = []\n    step = 0\n    while step < steps:\n"
                               "        history.append(float(torch.mean((X @ current - y) ** 2)))\n"
                               "        current = current - lr * mse_grad(current, X, y)\n        step += 1\n"
                               "    return current, history\n",
    "critical_lr_answer": "def critical_lr(X):\n    hessian = 2 * X.T.matmul(X) / X.size(0)\n"
                          "    top = torch.linalg.eigvalsh(hessian)[-1]\n    return 2 / float(top)\n",
}
# … and a copy of it: every name changed, comments added, lines wrapped differently.
COPY = {
    "mse_grad_answer": "def mse_grad(w, X, y):\n    # residuals first\n    r = torch.matmul(X, w) - y\n"
                       "    s = r.mul(2.0).div(\n        len(y))  # scale\n    return torch.matmul(X.transpose(0, 1), s)\n",
    "numerical_grad_answer": "def numerical_grad(f, w, eps=1e-3):\n    v = w.detach().reshape(-1).clone()\n"
                             "    g = torch.empty_like(v)\n    for j in range(v.shape[0]):  # each coordinate\n"
                             "        a, b = v.clone(), v.clone()\n        a[j] += eps\n        b[j] -= eps\n"
                             "        fa = f(a.reshape(w.shape))\n        fb = f(b.reshape(w.shape))\n"
                             "        g[j] = (float(fa) -\n                float(fb)) / (2 * eps)\n"
                             "    return g.reshape(w.shape)\n",
    "gradient_descent_answer": "def gradient_descent(w0, X, y, lr, steps):\n    theta = w0.detach().clone()\n"
                               "    ls = []\n    t = 0\n    while t < steps:\n"
                               "        ls.append(float(torch.mean((X @ theta - y) ** 2)))  # loss before\n"
                               "        theta = theta - lr * mse_grad(theta, X, y)\n        t += 1\n"
                               "    return theta, ls\n",
    "critical_lr_answer": "def critical_lr(X):\n    h = 2 * X.T.matmul(X) / X.size(0)\n"
                          "    m = torch.linalg.eigvalsh(h)[-1]\n    return 2 / float(m)\n",
}
# Another student's independent writing (the instructor class's honest answers where it has them).
INDEPENDENT = {
    **REFERENCE,
    **{cell: source for cell, source in HONEST.values()},
    "gradient_descent_answer": "def gradient_descent(w0, X, y, lr, steps):\n    w, losses = w0.clone(), []\n"
                               "    for _ in range(steps):\n        err = X @ w - y\n"
                               "        losses.append(err.pow(2).mean().item())\n"
                               "        w = w - lr * 2 * X.T @ err / X.shape[0]\n    return w, losses\n",
    "best_momentum_answer": "def best_momentum(X):\n    s = torch.linalg.svdvals(X.double())\n"
                            "    lam = 2 * s ** 2 / X.shape[0]\n    a, b = lam.min().sqrt(), lam.max().sqrt()\n"
                            "    return float(4 / (a + b) ** 2), float(((b - a) / (b + a)) ** 2)\n",
}
# A one-line answer two students happen to write alike, rare in the class.
SHORT = "def critical_lr(X):\n    return 2.0 / torch.linalg.matrix_norm(2.0 * X.T @ X / X.shape[0], ord=2).item()\n"


def a_class():
    return {
        **{f"ref-{i}": dict(REFERENCE) for i in range(5)},  # many hand-ins alike: common code, no evidence
        "honest-a": dict(INDEPENDENT),
        "planted-p": ORIGINAL, "planted-q": COPY,
        "short-s1": {"critical_lr_answer": SHORT}, "short-s2": {"critical_lr_answer": SHORT},
        "blank": {},
    }


def test_a_planted_copy_is_found_with_its_shared_lines_and_nothing_else():
    found = compare(a_class(), A.release)
    assert found["compared"] == 10  # the blank hand-in has no answer to compare
    assert [p["students"] for p in found["pairs"]] == [["planted-p", "planted-q"]]
    pair = found["pairs"][0]
    assert pair["similarity"] >= SHARE and pair["shared_tokens"] >= MIN_TOKENS
    assert [c["cell"] for c in pair["cells"]] == sorted(ORIGINAL)
    mse = next(c for c in pair["cells"] if c["cell"] == "mse_grad_answer")
    assert "    return torch.matmul(X.transpose(0, 1), scaled)" in mse["lines"][0]
    assert "    return torch.matmul(X.transpose(0, 1), s)" in mse["lines"][1]


def test_the_release_text_is_not_evidence():
    import nbformat

    stubs = {cells.grade_id(c): c.source for c in nbformat.read(A.release, as_version=4).cells
             if cells.kind(c) == cells.ANSWER}
    assert compare({"a": stubs, "b": dict(stubs), "c": dict(stubs)}, A.release)["pairs"] == []
    assert compare({"a": stubs, "b": dict(stubs)}, A.release.with_name("missing.ipynb"))["pairs"] != []


def test_renaming_and_reformatting_do_not_change_the_tokens():
    assert [t.text for t in tokens(ORIGINAL["critical_lr_answer"])] == [t.text for t in tokens(COPY["critical_lr_answer"])]
    assert tokens("x = 'a'  # c\n")[2].text == "S"
    assert [t.text for t in tokens("y.sum(z)")] == ["V", ".", "sum", "(", "V", ")", ";"]
    assert tokens("def f(:\n  'unterminated")  # code that does not tokenize still compares, word by word


def test_winnowing_keeps_a_fingerprint_of_every_run_of_w_plus_k_minus_1_tokens():
    text = " ".join(f"a{i} + {i} *" for i in range(60))
    grams = kgrams(tokens(text))
    chosen = winnow(grams)
    window = 5 + K - 1
    for start in range(len(grams) - 5 + 1):
        assert {h for _, h in grams[start:start + 5]} & chosen, f"no fingerprint in tokens {start}..{start + window}"


def test_the_min_tokens_threshold_is_above_any_short_answer_of_the_course():
    # "short": a reference answer of at most MIN_TOKENS tokens. All of it shared covers its non-template k-grams.
    covered = {}
    for assignment in assignments():
        template = template_grams(assignment.release)
        for cell in reference_submission(assignment).cells:
            if cells.kind(cell) == cells.ANSWER and len(tokens(cell.source)) <= MIN_TOKENS:
                starts = [i for i, h in kgrams(tokens(cell.source)) if h not in template]
                covered[assignment.name, cells.grade_id(cell)] = len({i + j for i in starts for j in range(K)})
    assert len(covered) >= 6 and max(covered.values()) < MIN_TOKENS, covered


def test_the_report_lists_the_pair_and_never_changes_a_grade(tmp_path):
    rows = [{"student": s, "assignment": ONE, "scores": {"mse_grad": 3.0}, "max_scores": {"mse_grad": 3.0},
             "status": [], "answers": answers} for s, answers in a_class().items()]
    (tmp_path / "results.json").write_text(json.dumps(rows))
    page = write_report(tmp_path).read_text()
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    pairs = data["similarity"]["assignments"][ONE]["pairs"]
    assert [p["students"] for p in pairs] == [["planted-p", "planted-q"]]
    assert "planted-p and planted-q" in page and "scaled = residual.mul(2.0).div(len(y))" in page
    assert "Grades are not changed" in page
    assert data["assignments"][ONE]["mean_total"] == 3.0


def test_the_share_threshold_lies_between_independent_writings_and_a_copy(monkeypatch):
    import grader.report.similarity as similarity

    monkeypatch.setattr(similarity, "SHARE", 0.0)
    monkeypatch.setattr(similarity, "MIN_TOKENS", 0)
    found = compare({"reference": REFERENCE, "independent": INDEPENDENT, "original": ORIGINAL}, A.release)["pairs"]
    assert len(found) == 3 and max(p["similarity"] for p in found) < 0.25 < SHARE
    (copied,) = compare({"original": ORIGINAL, "copy": COPY}, A.release)["pairs"]
    assert copied["similarity"] > 0.9
