"""The audit trail's file on its own (the server's entries: test_server_secure.py): one chain from several processes
and threads writing at once, and every kind of tampering found by `verify` and `rocm-zoo audit verify`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from rocm_zoo.server.audit.trail import AuditTrail, entry_hash, process_actor

WRITER = """
import sys
from rocm_zoo.server.audit.trail import AuditTrail, process_actor
trail = AuditTrail(sys.argv[1])
for i in range(int(sys.argv[3])):
    trail.record("label.saved", process_actor("rocm-zoo test"), image=f"{sys.argv[2]}-{i}", tag="final")
"""


def _written(tmp_path, count=6) -> AuditTrail:
    trail = AuditTrail(tmp_path / "logs" / "audit.jsonl")
    for i in range(count):
        trail.record("label.saved", {"user": f"user{i % 2}", "role": "annotator", "address": "127.0.0.1"},
                     image=f"img{i}", tag="final")
    return trail


def _lines(trail):
    return trail.path.read_text().splitlines()


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rocm_zoo.cli", "audit", *args], capture_output=True, text=True,
                          timeout=120)


def test_processes_and_threads_writing_at_once_make_one_chain(tmp_path):
    trail = AuditTrail(tmp_path / "logs" / "audit.jsonl")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(trail.path), f"p{n}", "40"]) for n in range(3)]

    def threads_write(name):
        for i in range(40):
            trail.record("login", {"user": name, "role": "annotator", "address": "127.0.0.1"})

    threads = [threading.Thread(target=threads_write, args=(f"t{n}",)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(p.wait(timeout=120) == 0 for p in procs)

    verdict = trail.verify()
    assert verdict.intact, verdict.problems
    assert verdict.entries == 5 * 40
    entries = list(trail.entries())
    assert [e["seq"] for e in entries] == list(range(1, 201))
    assert all(e["prev"] == before["hash"] for before, e in zip(entries, entries[1:]))
    assert len(list(trail.entries(event="label"))) == 120
    assert {e["details"]["image"] for e in trail.entries(user=process_actor("rocm-zoo x")["user"])} == \
        {f"p{n}-{i}" for n in range(3) for i in range(40)}
    assert trail.path.stat().st_mode & 0o777 == 0o600
    assert trail.path.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("tamper", ["edit", "remove", "insert", "swap", "truncate", "rehash_one", "no_head"])
def test_verify_finds_each_kind_of_tampering(tmp_path, tamper):
    trail = _written(tmp_path)
    assert trail.verify().intact
    lines = _lines(trail)
    entries = [json.loads(x) for x in lines]
    if tamper == "edit":  # another user named as the author, hash left as it was
        entries[2]["actor"]["user"] = "someone-else"
        lines[2] = json.dumps(entries[2])
    elif tamper == "remove":
        del lines[3]
    elif tamper == "insert":
        forged = dict(entries[2], seq=4, details={"image": "forged"})
        forged["hash"] = entry_hash(forged)
        lines.insert(3, json.dumps(forged))
    elif tamper == "swap":
        lines[1], lines[2] = lines[2], lines[1]
    elif tamper == "truncate":  # the last entries taken away: the chain alone still holds, the head file does not
        lines = lines[:-2]
    elif tamper == "rehash_one":  # edited and re-hashed: the next entry no longer follows it
        entries[1]["details"]["image"] = "other"
        entries[1]["hash"] = entry_hash(entries[1])
        lines[1] = json.dumps(entries[1])
    elif tamper == "no_head":
        trail.head.unlink()
    trail.path.write_text("\n".join(lines) + "\n")

    verdict = trail.verify()
    assert not verdict.intact
    where = {"edit": "line 3", "remove": "line 4", "insert": "line 4", "swap": "line 2", "truncate": "head file",
             "rehash_one": "line 3", "no_head": "head file"}[tamper]
    assert any(where in p for p in verdict.problems), verdict.problems

    done = _cli("verify", "--file", str(trail.path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT INTACT" in done.stderr and where in done.stderr


def test_a_torn_last_line_is_reported_and_the_trail_goes_on(tmp_path):
    """A crash in the middle of an append leaves part of a line: the next entry still chains onto the last whole
    one, and verify names the torn line."""
    trail = _written(tmp_path, 3)
    with open(trail.path, "ab") as log:
        log.write(b'{"seq": 4, "time": "2026-')
    after = trail.record("login", {"user": "adm", "role": "admin", "address": "127.0.0.1"})
    assert after["seq"] == 4 and after["prev"] == json.loads(_lines(trail)[2])["hash"]
    verdict = trail.verify()
    assert verdict.problems == ["line 4 is not a JSON entry"]


def test_cli_verify_and_show(tmp_path):
    trail = _written(tmp_path, 4)
    done = _cli("verify", "--app", str(tmp_path))
    assert done.returncode == 0 and "intact: 4 entries" in done.stdout, done.stderr
    shown = _cli("show", "--app", str(tmp_path), "--user", "user1")
    assert shown.returncode == 0, shown.stderr
    rows = shown.stdout.splitlines()
    assert len(rows) == 2 and all("user1 (annotator)" in r for r in rows) and "image=img1" in rows[0]
    as_json = _cli("show", "--file", str(trail.path), "--image", "img2", "--json")
    assert [json.loads(x)["details"]["image"] for x in as_json.stdout.splitlines()] == ["img2"]
    future = _cli("show", "--file", str(trail.path), "--since", "2999-01-01")
    assert future.returncode == 0 and future.stdout == ""
    missing = _cli("verify", "--file", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and "no audit trail" in missing.stderr


def test_verify_during_appends_sees_no_lost_entries(tmp_path):
    """A reader checking the chain while another thread appends (the server records a request after answering it,
    while an admin reads /audit/): each check sees whole appends, never a line without its head record."""
    trail = AuditTrail(tmp_path / "logs" / "audit.jsonl")
    trail.record("server.started", process_actor("server"))
    done = threading.Event()

    def append():
        for i in range(300):
            trail.record("label.saved", {"user": "ann", "role": "annotator", "address": "127.0.0.1"}, image=f"i{i}")
        done.set()

    writer = threading.Thread(target=append)
    writer.start()
    checks = []
    while not done.is_set():
        checks.append(AuditTrail(trail.path).verify())  # another handle, as another process would read it
    writer.join()
    assert checks and all(v.intact for v in checks), [v.problems for v in checks if not v.intact][:3]
    assert trail.verify().entries == 301
