"""A merged decoder (Hugging Face Optimum's ``optimum.onnx.merge_decoders``) read as its with-past
graph, the form a ``--max-seq`` build takes.

A merged decoder is one graph whose every output comes from one ``If`` on a bool input
``use_cache_branch`` [1]: its ``then_branch`` is the decoder with past (taken when the flag is
true), its ``else_branch`` the decoder without past (which ignores the past inputs).  The with-past
branch computes every call a paged build makes — a prefill is that branch with a past of length 0,
as ONNX Runtime runs the merged graph with the flag true — so ``select_cache_branch`` replaces the
``If`` by that branch's nodes (its outputs renamed to the graph's, its initializers moved to the
graph) and drops the flag input.
"""

from __future__ import annotations

import onnx

CACHE_FLAG = "use_cache_branch"


def merged_if(model: onnx.ModelProto) -> onnx.NodeProto | None:
    """The ``If`` of a merged decoder (module docstring), or None when ``model`` is not one: the
    graph's only node, on the graph's bool input ``use_cache_branch``, producing every output."""
    g = model.graph
    flag = next((i for i in g.input if i.name == CACHE_FLAG), None)
    if (
        flag is None
        or len(g.node) != 1
        or g.node[0].op_type != "If"
        or g.node[0].domain not in ("", "ai.onnx")
    ):
        return None
    node = g.node[0]
    if list(node.input) != [CACHE_FLAG] or flag.type.tensor_type.elem_type != onnx.TensorProto.BOOL:
        return None
    if [o.name for o in g.output] != list(node.output):
        return None
    return node


def select_cache_branch(model: onnx.ModelProto) -> bool:
    """Replace, in place, a merged decoder's ``If`` by its with-past branch (module docstring);
    False (``model`` unchanged) when ``model`` is not a merged decoder."""
    node = merged_if(model)
    if node is None:
        return False
    branch = next(a.g for a in node.attribute if a.name == "then_branch")
    rename = {o.name: out for o, out in zip(branch.output, node.output, strict=True)}
    g = model.graph
    nodes = []
    for n in branch.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        for i, x in enumerate(m.output):
            m.output[i] = rename.get(x, x)
        for i, x in enumerate(m.input):
            m.input[i] = rename.get(x, x)
        nodes.append(m)
    for i, out in enumerate(branch.output):  # an output that is an input or initializer as is
        if out.name in rename and not any(out.name in n.output for n in branch.node):
            nodes.append(onnx.helper.make_node("Identity", [out.name], [node.output[i]]))
    g.initializer.extend(branch.initializer)
    del g.node[:]
    g.node.extend(nodes)
    keep = [i for i in g.input if i.name != CACHE_FLAG]
    del g.input[:]
    g.input.extend(keep)
    return True
