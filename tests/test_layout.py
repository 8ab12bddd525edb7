"""Where code lives: `utils` is what the notebooks teach and call, `course` the machinery that
runs, checks and publishes them; no two `utils` modules import each other."""

import ast
from pathlib import Path

UTILS = Path(__file__).resolve().parent.parent / "utils"


def imported_utils_modules(path: Path) -> set[str]:
    """The `utils.X` modules a file imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("utils."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "utils":
            found |= {alias.name for alias in node.names if (UTILS / f"{alias.name}.py").exists()}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("utils.")}
    return found - {path.stem}


def test_no_two_utils_modules_import_each_other():
    """utils.gpt held the generic training helpers that bert, vit and taming import; they moved
    to utils.train, utils.text and utils.transformer, so each import goes one way."""
    graph = {p.stem: imported_utils_modules(p) for p in UTILS.glob("*.py") if p.stem != "__init__"}
    mutual = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps if a in graph.get(b, ())})
    assert not mutual, f"utils modules that import each other: {mutual}"


def test_utils_holds_no_course_machinery():
    """The site, notebook metadata, runner, README tables and device check live in `course`."""
    names = {p.stem for p in UTILS.glob("*.py")}
    assert not names & {"site", "notebook_meta", "course", "devicecheck"}
    results = (UTILS / "results.py").read_text()
    assert "README" not in results and "render_table" not in results


def test_models_other_than_the_gpt_do_not_import_it_for_training_helpers():
    """AdamW with decay on matrices, random windows of a token stream and the fused layer norm
    are generic: bert and vit read them from utils.train, utils.text and utils.transformer, not
    from the GPT's module (they once did, and bert had to import it inside a function)."""
    for name in ("bert", "vit"):
        assert "gpt" not in imported_utils_modules(UTILS / f"{name}.py"), name
    taming = ast.parse((UTILS / "taming.py").read_text())
    from_gpt = {a.name for n in ast.walk(taming) if isinstance(n, ast.ImportFrom) and n.module == "utils.gpt"
                for a in n.names}
    assert from_gpt <= {"GPT", "GPTConfig", "evaluate_lm", "lm_step"}, from_gpt
