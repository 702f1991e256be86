"""The machine's pip configuration as uv's options, one per line, for setup.sh: the indexes, find-links and
constraints `pip config list` shows (global, user, site and PIP_* environment alike), so that uv installs from where
pip would; uv reads none of pip's files itself. `uv_args.py cert` prints pip's certificate file instead (setup.sh
hands it to uv as SSL_CERT_FILE), or nothing.
"""

from __future__ import annotations

import re
import subprocess
import sys

# pip's key (its last part) -> uv's option; several values of one key are separated by whitespace, as pip writes them
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}  # fmt: skip


def pip_config() -> dict[str, str]:
    """{key: value} of `pip config list` (later lines win: pip's own order of precedence)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    found = {}
    for line in listed.splitlines():
        match = re.match(r"^[^=]*?([\w-]+)='(.*)'$", line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def main() -> None:
    config = pip_config()
    if sys.argv[1:] == ["cert"]:
        print(config.get("cert", ""))
        return
    for key, option in OPTIONS.items():
        for value in config.get(key, "").split():
            print(option)
            print(value)
    if config.get("extra-index-url") or config.get("index-url"):
        print("--index-strategy")  # pip takes the best version across its indexes; uv the first index's unless told
        print("unsafe-best-match")


if __name__ == "__main__":
    main()
