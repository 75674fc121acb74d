"""Reading the package's source as syntax trees, for the tests that check what it imports and writes out."""

import ast


def docstring_ids(tree: ast.AST) -> set:
    """The ``id`` of each docstring's constant node in ``tree`` (the module's, classes' and functions'):
    prose, which a test of the strings code writes out passes over."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out
