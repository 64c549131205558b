"""A long-lived ``manage.py`` for one live server (tests/live.py): Django is set up once, with
the server's environment, and each command read from stdin runs in this process.

``LiveServer.manage`` paid a Python start and ``django.setup()`` (about 1.3 s) for every key it
minted and every ``shell -c`` it ran, dozens of times a suite. The protocol is one JSON line
each way: the command's argv in, ``{"ok": bool, "out": str}`` out, where ``out`` is what the
command printed (its stdout and stderr, as ``capture_output`` gave them before). Database
connections are closed after every command, so nothing is held between them (a database
outage test, DROP DATABASE at the end).
"""

from __future__ import annotations

import io
import json
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout


def main() -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    # Replies go to a copy of the pipe; file descriptor 1 becomes stderr (the server's log), so
    # nothing a command writes below Python's sys.stdout can corrupt the protocol.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        argv = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        ok = True
        try:
            with redirect_stdout(out), redirect_stderr(err):
                call_command(*argv, stdout=out, stderr=err)
        except BaseException:  # noqa: BLE001 - reported to the test, which raises it
            ok = False
            err.write(traceback.format_exc())
        finally:
            connections.close_all()
        reply.write(json.dumps({"ok": ok, "out": out.getvalue(), "err": err.getvalue()}) + "\n")
        reply.flush()


if __name__ == "__main__":
    main()
