"""Go ``flag`` syntax, strictly: what Volcano accepts parses the same; what it drops is an error."""

import pytest

from volcano_job_webhook.plugins.errors import FlagError
from volcano_job_webhook.plugins.flags import Flag, go_prefix, parse_flags, parse_go_int, port_flag, volcano_flags

FLAGS = (
    Flag("master", "string", "master"),
    port_flag("port", 23456),
    Flag("enabled", "bool", False),
    Flag("timeout", "int", 300, minimum=0),
    port_flag("clientPort", 10001, aliases=("clientServerPort",)),
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], {}),
        (["--master=boss"], {"master": "boss"}),
        (["-master=boss"], {"master": "boss"}),
        (["--master", "boss"], {"master": "boss"}),
        (["--master", "-weird"], {"master": "-weird"}),  # a value may start with '-' (Go does the same)
        (["--master="], {"master": ""}),
        (["--enabled"], {"enabled": True}),
        (["--enabled=false"], {"enabled": False}),
        (["--enabled=T"], {"enabled": True}),
        (["--enabled=0"], {"enabled": False}),
        (["--port=0x10"], {"port": 16}),
        (["--port=010"], {"port": 8}),
        (["--port=0o17"], {"port": 15}),
        (["--port=0b11"], {"port": 3}),
        (["--port=1_000"], {"port": 1000}),
        (["--port=+80"], {"port": 80}),
        (["--port=1", "--port=2"], {"port": 2}),
        (["--clientServerPort=1234"], {"clientPort": 1234}),
        (["--master=a", "--"], {"master": "a"}),
    ],
)
def test_accepted(args, expected):
    values = parse_flags(FLAGS, args)
    defaults = {f.name: f.default for f in FLAGS}
    assert values == {**defaults, **expected}


@pytest.mark.parametrize(
    ("args", "flag", "reason"),
    [
        (["--nope=1"], "--nope", "flag provided but not defined"),
        (["--clientport=1"], "--clientport", "flag provided but not defined"),  # case-sensitive
        (["-h"], "--h", "flag provided but not defined"),
        (["--port=abc"], "--port", "invalid value 'abc'"),
        (["--port=0"], "--port", "outside 1..65535"),
        (["--port=70000"], "--port", "outside 1..65535"),
        (["--port=1_"], "--port", "invalid value"),
        (["--port=08"], "--port", "invalid value"),
        (["--timeout=-1"], "--timeout", "outside 0..None"),
        (["--enabled=yes"], "--enabled", "invalid boolean"),
        (["--port"], "--port", "flag needs an argument"),
        (["master"], "argument 'master'", "unexpected argument"),
        (["--master=a --port=1", "x"], "argument 'x'", "unexpected argument"),
        (["---x"], "argument '---x'", "bad flag syntax"),
        (["-=x"], "argument '-=x'", "bad flag syntax"),
        (["--", "--port=1"], "--", "would be ignored"),
    ],
)
def test_rejected(args, flag, reason):
    with pytest.raises(FlagError) as info:
        parse_flags(FLAGS, args)
    assert info.value.flag == flag
    assert reason in info.value.reason


def test_single_token_with_spaces_is_one_flag():
    # Go takes "--master=a --port=1" as the flag master with value "a --port=1".
    assert parse_flags(FLAGS, ["--master=a --port=1"])["master"] == "a --port=1"


def test_go_int_range():
    assert parse_go_int("9223372036854775807") == 2**63 - 1
    with pytest.raises(ValueError, match=r"^value out of range '9223372036854775808'$"):
        parse_go_int("9223372036854775808")


def test_long_tokens_are_not_echoed():
    key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA3qSfd0j7FfhNDQlCfCw8kfXadgsXdwxkSADCtbZ2DAKzB0+h"
    for args in (["--master=", key], [key], ["--port=" + key]):
        with pytest.raises(FlagError) as info:
            parse_flags(FLAGS, args)
        assert "MIIEow" not in str(info.value)


LISTS = (Flag("allow", "list", (), ours=True), Flag("master", "string", "master"))


def test_a_list_flag_keeps_every_occurrence_in_order() -> None:
    """Go's flag.Var with a Value whose Set appends: each occurrence adds its whole text, commas and all."""
    values = parse_flags(LISTS, ["--allow=a=1,b in (x,y)", "--master", "m", "-allow", "c", "--allow="])
    assert values == {"allow": ("a=1,b in (x,y)", "c", ""), "master": "m"}
    assert parse_flags(LISTS, [])["allow"] == ()
    with pytest.raises(FlagError, match="flag needs an argument"):
        parse_flags(LISTS, ["--allow"])


def test_volcanos_flags_leave_ours_out() -> None:
    assert volcano_flags(LISTS) == (LISTS[1],)
    kept, error = go_prefix(volcano_flags(LISTS), ["--master=m", "--allow=x", "--master=n"])
    assert kept == ["--master=m"] and error is not None and error.flag == "--allow"
