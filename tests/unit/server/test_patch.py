"""JSON patches address only what changed and apply back to the new document."""

import copy

import jsonpatch
import pytest

from volcano_job_webhook.server.patch import escape, make_patch

POD = {
    "metadata": {"name": "p", "labels": {"a/b": "1"}},
    "spec": {"containers": [{"name": "c", "env": [{"name": "X", "value": "1"}]}]},
}


def test_equal_documents_give_no_operations():
    assert make_patch(POD, copy.deepcopy(POD)) == []


def test_appends_use_dash_and_missing_fields_are_added_whole():
    new = copy.deepcopy(POD)
    new["spec"]["containers"][0]["env"].append({"name": "Y", "value": "2"})
    new["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    new["spec"]["hostname"] = "p"
    ops = make_patch(POD, new)
    assert ops == [
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "Y", "value": "2"}},
        {"op": "add", "path": "/spec/volumes", "value": [{"name": "v", "emptyDir": {}}]},
        {"op": "add", "path": "/spec/hostname", "value": "p"},
    ]


def test_changed_values_are_replaced_in_place():
    new = copy.deepcopy(POD)
    new["spec"]["containers"][0]["env"][0]["value"] = "9"
    assert make_patch(POD, new) == [{"op": "replace", "path": "/spec/containers/0/env/0/value", "value": "9"}]


def test_items_put_in_front_are_inserted_there():
    """Variables placed before a container's own (env placement first): an insert per new item, and
    the old items, moved back, changed in place only where they changed."""
    old = copy.deepcopy(POD)
    old["spec"]["containers"][0]["env"] += [{"name": "Y", "value": "$(RANK)"}, {"name": "Z", "value": "z"}]
    new = copy.deepcopy(old)
    env = new["spec"]["containers"][0]["env"]
    env[0:0] = [{"name": "RANK", "value": "1"}, {"name": "WORLD", "value": "2"}]
    assert make_patch(old, new) == [
        {"op": "add", "path": "/spec/containers/0/env/0", "value": {"name": "RANK", "value": "1"}},
        {"op": "add", "path": "/spec/containers/0/env/1", "value": {"name": "WORLD", "value": "2"}},
    ]
    env[3]["value"] = "9"
    ops = make_patch(old, new)
    assert ops[2:] == [{"op": "replace", "path": "/spec/containers/0/env/3/value", "value": "9"}]
    assert jsonpatch.apply_patch(old, ops) == new


def test_an_insert_is_used_only_when_it_takes_fewer_operations():
    old = {"l": [1, 2, 3, 4]}
    assert make_patch(old, {"l": [1, 2, 3, 4, 9]}) == [{"op": "add", "path": "/l/-", "value": 9}]
    new = {"l": [5, 2, 3, 4, 1]}  # one replaced and one appended, or one inserted and three replaced
    ops = make_patch(old, new)
    assert ops == [{"op": "replace", "path": "/l/0", "value": 5}, {"op": "add", "path": "/l/-", "value": 1}]
    assert jsonpatch.apply_patch(old, ops) == new


def test_keys_are_escaped():
    new = copy.deepcopy(POD)
    new["metadata"]["labels"]["x~y/z"] = "2"
    ops = make_patch(POD, new)
    assert ops == [{"op": "add", "path": "/metadata/labels/x~0y~1z", "value": "2"}]
    assert escape("a/b~c") == "a~1b~0c"


@pytest.mark.parametrize(
    "new",
    [
        {"metadata": {"name": "q"}, "spec": {"containers": []}},
        {"metadata": {"name": "p", "labels": {}}, "spec": {"containers": [{"name": "c"}, {"name": "d"}]}},
        {"metadata": None, "spec": {"containers": [{"name": "c", "env": []}]}},
    ],
)
def test_patch_applies(new):
    assert jsonpatch.apply_patch(POD, make_patch(POD, new)) == new
