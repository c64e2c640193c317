"""A real SoftHSM2 token for the PKCS#11 tests.

One token directory per test run (SoftHSM2 reads its configuration once per process, when the
library is initialised), with a few tokens made up front by ``softhsm2-util``. Tests make
their keys inside them with unique labels. Without SoftHSM2 (Debian ``softhsm2``) or the
``pkcs11`` extra the tests skip with the reason; with ``A2A_SECURE_REQUIRE_SOFTHSM=1`` (CI
sets it after installing the packages) they fail instead.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE_ENV = "A2A_SECURE_REQUIRE_SOFTHSM"
MODULE_CANDIDATES = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/local/lib/softhsm/libsofthsm2.so",
)
PIN = "1234"
SO_PIN = "5678"
# No label is a prefix of another: opensc's pkcs11-tool matches --token-label by prefix.
TOKENS = ("a2a", "other", "tool")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, or fail it when ``A2A_SECURE_REQUIRE_SOFTHSM=1``."""
    if os.environ.get(REQUIRE_ENV, "") == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(f"{reason} (set {REQUIRE_ENV}=1 to make this a failure)")


@dataclass(frozen=True)
class SoftHsm:
    module: str
    conf: Path

    def uri(self, label: str, *, token: str = "a2a", pin: str = PIN) -> str:
        return f"pkcs11:token={token};object={label};type=private?pin-value={pin}&module-path={self.module}"

    def env(self) -> dict[str, str]:
        """The environment a subprocess needs to find the same tokens."""
        return {**os.environ, "SOFTHSM2_CONF": str(self.conf)}

    def tool(self, *args: str, token: str = "a2a") -> subprocess.CompletedProcess[str]:
        """opensc's pkcs11-tool against the token, logged in."""
        tool = shutil.which("pkcs11-tool")
        if tool is None:
            skip_or_fail("pkcs11-tool (Debian opensc) is not installed")
        argv = [tool, "--module", self.module, "--token-label", token, "--login", "--pin", PIN, *args]
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=30, check=True)


def fresh_label(prefix: str = "agent") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


@pytest.fixture(scope="session")
def softhsm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftHsm]:
    util = shutil.which("softhsm2-util")
    module = next((m for m in MODULE_CANDIDATES if Path(m).is_file()), None)
    if util is None or module is None:
        skip_or_fail("SoftHSM2 is not installed (Debian package softhsm2)")
    try:
        import pkcs11  # noqa: F401
    except ImportError:
        skip_or_fail("the pkcs11 extra (python-pkcs11) is not installed")
    base = tmp_path_factory.mktemp("softhsm")
    (base / "tokens").mkdir()
    conf = base / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {base / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    env = {**os.environ, "SOFTHSM2_CONF": str(conf)}
    for label in TOKENS:
        subprocess.run(
            [util, "--init-token", "--free", "--label", label, "--pin", PIN, "--so-pin", SO_PIN],
            env=env, capture_output=True, check=True, timeout=30,
        )  # fmt: skip
    previous = os.environ.get("SOFTHSM2_CONF")
    os.environ["SOFTHSM2_CONF"] = str(conf)  # this process's library reads it when first loaded
    try:
        yield SoftHsm(module, conf)
    finally:
        from a2a_secure.identity import pkcs11 as token_module

        token_module._forget_sessions()
        if previous is None:
            os.environ.pop("SOFTHSM2_CONF", None)
        else:
            os.environ["SOFTHSM2_CONF"] = previous
