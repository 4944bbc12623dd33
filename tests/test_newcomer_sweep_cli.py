"""What a new user hit with `sweep`: an unreachable Ray address hung for minutes (now a one-line error within
seconds), and `sweep --help` named `python -m mimo_numerics.sweep` as the program."""

import socket
import subprocess
import sys
import time

import pytest

from mimo_numerics import cli, sweep


def _free_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address, endpoint", [
    ("127.0.0.1:1", ("127.0.0.1", 1)), ("head", ("head", 6379)), ("ray://head", ("head", 10001)),
    ("ray://10.0.0.2:10002", ("10.0.0.2", 10002)), ("[::1]:6380", ("::1", 6380)),
    (None, None), ("auto", None), ("local", None)])
def test_ray_endpoint_names_the_host_and_port_ray_init_connects_to(address, endpoint):
    assert sweep.ray_endpoint(address) == endpoint


@pytest.mark.parametrize("address", ["http://head:6379", "head:port", "head:0", "head:70000", ":6379"])
def test_ray_endpoint_refuses_what_is_no_ray_address(address):
    with pytest.raises(ValueError, match="address"):
        sweep.ray_endpoint(address)


def test_an_address_nothing_listens_on_fails_within_seconds():
    address = f"127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=f"cannot connect to 127.0.0.1:.*{address}.*ray start --head"):
        sweep.parallel_map(abs, [1, 2], workers=2, progress=False, executor="ray", address=address)
    assert time.monotonic() - started < 5


def test_a_silent_address_times_out_with_the_timeout_named(monkeypatch):
    def silent(endpoint, timeout):
        assert timeout == 0.5
        raise socket.timeout("timed out")

    monkeypatch.setattr(sweep.socket, "create_connection", silent)
    with pytest.raises(ConnectionError, match=r"no answer from 10\.1\.2\.3:6379 .* within 0\.5 s"):
        sweep.check_ray_address("10.1.2.3", timeout=0.5)


def test_cli_sweep_on_an_unreachable_ray_address_is_one_line_within_seconds():
    address = f"127.0.0.1:{_free_port()}"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mimo_numerics", "sweep", "--executor", "ray", "--address", address,
                           "--connect-timeout", "3"], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0] and address in lines[0], proc.stderr
    assert "(hint: check --address" in lines[0]
    assert proc.stdout == ""
    assert elapsed < 60  # the interpreter and torch import included; ray.init alone used to wait for minutes


def test_sweep_help_names_the_cli_program(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sweep", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mimo-numerics sweep ") and "python -m" not in out
    assert "--connect-timeout" in out
