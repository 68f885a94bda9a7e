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
