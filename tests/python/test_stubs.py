"""python/braid/_C.pyi against the compiled extension braid._C: the same module-level
names, the same methods, properties and enum members on every class, and the same
parameter names (from pybind11's signatures) for every function. Fails when a binding is
added, removed or renamed without its stub (mypy's stubtest cannot read pybind11's
builtins, so this reads their signature lines instead)."""
import ast
import re
from pathlib import Path

import braid._C as C

STUB = Path(__file__).resolve().parents[2] / "python" / "braid" / "_C.pyi"


def _stub():
    tree = ast.parse(STUB.read_text())
    funcs, classes = {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            funcs[node.name] = node
        elif isinstance(node, ast.ClassDef):
            members = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[item.name] = item
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = item
            classes[node.name] = members
    return funcs, classes


def _stub_params(fn: ast.FunctionDef):
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg != "self"]


def _split_top(s: str):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def _ext_params(obj, name):
    """Parameter names from pybind11's first docstring line, or None when overloaded."""
    doc = (getattr(obj, "__doc__", "") or "").strip()
    if not doc or doc.startswith("Overloaded function"):
        return None
    m = re.match(rf"{re.escape(name)}\((.*)\)\s*->", doc.splitlines()[0])
    if not m:
        return None
    names = [p.split(":")[0].split("=")[0].strip() for p in _split_top(m.group(1))]
    return [n for n in names if n and n not in ("self", "*", "/")]


def _public(names):
    return {n for n in names if not n.startswith("_") or n == "__init__"}


def test_module_level_names_match():
    funcs, classes = _stub()
    ext = {n for n in dir(C) if not n.startswith("_")}
    stub = set(funcs) | set(classes)
    assert ext == stub, (f"in the extension, not the stub: {sorted(ext - stub)}; "
                         f"in the stub, not the extension: {sorted(stub - ext)}")


def test_function_parameters_match():
    funcs, _ = _stub()
    bad = []
    for name, fn in funcs.items():
        got = _ext_params(getattr(C, name), name)
        if got is not None and got != _stub_params(fn):
            bad.append(f"{name}: extension takes {got}, stub says {_stub_params(fn)}")
    assert not bad, "\n".join(bad)


def test_class_members_and_parameters_match():
    _, classes = _stub()
    bad = []
    for cname, members in classes.items():
        cls = getattr(C, cname)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            continue  # exception classes carry attributes set at raise time (code, peer)
        ext = _public(vars(cls))
        enum = getattr(cls, "__members__", None)
        if enum is not None:
            ext |= set(enum)
            ext -= {"__init__"}  # pybind11 enums' constructor from int is not part of the API
        ext -= {"value"} if "value" not in members else set()
        stub = set(members) - ({"__init__"} if "__init__" not in ext else set())
        if ext != stub:
            bad.append(f"{cname}: in the extension, not the stub: {sorted(ext - stub)}; "
                       f"in the stub, not the extension: {sorted(stub - ext)}")
        for mname, node in members.items():
            if not isinstance(node, ast.FunctionDef) or mname not in vars(cls):
                continue
            got = _ext_params(vars(cls)[mname], mname)
            if got is not None and got != _stub_params(node) and not any(
                    isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
                bad.append(f"{cname}.{mname}: extension takes {got}, stub says {_stub_params(node)}")
    assert not bad, "\n".join(bad)


def test_docs_error_table_matches_the_exception_classes():
    """docs/python.md's error table names every braid exception class, each with the
    builtin it also is; a class added, removed or rebased without the docs fails here."""
    import builtins

    import braid

    doc = (Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    rows = re.findall(r"^\s*\| `braid\.(\w+)` \| (?:`(\w+)`)? *\|", doc, re.M)
    assert rows, "no error table in docs/python.md"
    documented = {name for name, _ in rows}
    classes = {n for n in dir(C) if isinstance(getattr(C, n), type) and issubclass(getattr(C, n), C.Error)}
    assert documented == classes, (f"in the extension, not the table: {sorted(classes - documented)}; "
                                   f"in the table, not the extension: {sorted(documented - classes)}")
    for name, also in rows:
        cls = getattr(braid, name)
        assert cls is getattr(C, name) and issubclass(cls, C.Error), name
        if also:
            assert issubclass(cls, getattr(builtins, also)), f"braid.{name} is documented as a {also}"
