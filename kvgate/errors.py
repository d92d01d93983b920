"""Domain exceptions. Only the CLI turns them into exit statuses."""

from __future__ import annotations

from kvgate.exitcodes import ExitStatus


class KvgateError(Exception):
    """Base class; `exit_status` is what the CLI exits with when this escapes a command."""

    exit_status: ExitStatus = ExitStatus.USAGE_ERROR


class UsageError(KvgateError):
    """Bad flags or arguments (exit 2)."""

    exit_status = ExitStatus.USAGE_ERROR


#: the most characters of a profile problem (and the values it quotes) an error message shows
PROBLEM_CLIP = 400
#: what a shortened text ends with where it was cut
CUT = "\u2026"


class ProfileError(UsageError):
    """A gate profile that does not validate (exit 2). The message names file, key and expectation."""

    def __init__(self, path: str, key: str | None, problem: str) -> None:
        # The problem may quote the profile's values: an excerpt, never a whole document. Redaction is the
        # output boundary's (kvgate/output/sinks.py), where every message is written: a cut leaves either
        # too little of a secret to be a fragment or enough for the boundary to recognise.
        if len(problem) > PROBLEM_CLIP:
            problem = problem[:PROBLEM_CLIP] + CUT
        self.path = path
        self.key = key
        self.problem = problem
        # key None: the whole file is the problem (missing, not YAML, not a mapping).
        super().__init__(f"profile {path}: " + (f"key '{key}': " if key else "") + problem)


class TransportError(KvgateError):
    """Target unreachable, timed out, 5xx on a metadata endpoint, or unparseable JSON (exit 4)."""

    exit_status = ExitStatus.TRANSPORT_ERROR

    def __init__(self, url: str, problem: str) -> None:
        self.url = url
        self.problem = problem
        super().__init__(f"{url}: {problem}")


class InternalError(KvgateError):
    """kvgate itself broke on something it did not expect (exit 5): a bug to report, never a pass."""

    exit_status = ExitStatus.INTERNAL_ERROR

    def __init__(self, where: str, exc: BaseException) -> None:
        self.where = where
        super().__init__(f"internal error in {where}: {type(exc).__name__}: {exc} (a kvgate bug; please report it)")


class Interrupted(KvgateError):
    """Ctrl-C or SIGTERM arrived before the command finished (exit 130): there is no verdict."""

    exit_status = ExitStatus.INTERRUPTED

    def __init__(self, command: str) -> None:
        super().__init__(f"{command}: interrupted (Ctrl-C or SIGTERM) before the run finished: no verdict")
