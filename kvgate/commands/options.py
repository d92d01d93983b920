"""The options the commands share, each defined once: its names, value checks, default and help.

Each flag is a `Flag`; calling it gives the `typer.Option` a command puts in its signature
(`verbose: bool = opt.verbose()`). Its help is the wording most commands show; a command whose flag means
something narrower passes its own help (and, where its default or bound differs, that too), so each
command's `--help` stays its own.
Nothing here loads library code: `--help` imports this module.
"""

from __future__ import annotations

from typing import Any

import typer

from kvgate.defaults import DEFAULT_CONCURRENCY

STRICT_HELP = (
    "Inconclusive checks block (exit 3): the default. --no-strict lets them pass; the report then says "
    "so and lists what was not observed."
)
VERBOSE_HELP = "Show every finding's detail in the table, passed ones too."
QUIET_HELP = "No progress lines on stderr (the report and errors still print)."


class Flag:
    """One shared option: its names, default, value checks (min, max, metavar, hidden) and usual help."""

    def __init__(self, *decls: str, default: Any = None, help: str | None = None, **checks: Any) -> None:
        self.decls, self.default, self.help, self.checks = decls, default, help, checks

    def __call__(self, help: str | None = None, **override: Any) -> Any:
        """The `typer.Option` for a signature: this command's help, and any default or check it sets itself."""
        settings = {"default": self.default, **self.checks, **override}
        return typer.Option(settings.pop("default"), *self.decls, help=self.help if help is None else help, **settings)


# The report: every reporting command.
format = Flag(
    "--format", "-f", default=[], help="Report format (repeatable): table, json, junit, markdown, sarif, html."
)
output = Flag("--output", "-o", default=[], help="File for the matching --format (repeatable).")
strict = Flag("--strict/--no-strict", help=STRICT_HELP)  # unset: the profile's, else strict
quiet = Flag("--quiet", "-q", default=False, help="No progress lines on stderr.")
verbose = Flag("--verbose", "-v", default=False, help=VERBOSE_HELP)
sarif_anchor = Flag(
    "--sarif-anchor",
    metavar="PATH",
    help=(
        "A file in the repository (e.g. the deployment's manifest) where SARIF anchors its results when no "
        "profile or baseline file there can be (else .kvgate/deployment)."
    ),
)

# The deployment gated (check, watch, soak): where it is, how it is read, what its workers run.
router_url = Flag("--router-url")
profile = Flag("--profile", help="Gate profile: a YAML file or a bundled name.")
# --token-env and --router-token-env name a variable; the token itself is never a flag.
token_env = Flag("--token-env", help="Name of the environment variable holding the bearer token.")
router_token_env = Flag(
    "--router-token-env",
    help="Name of the environment variable holding the router's control-plane key, sent only to its /workers "
    "and /get_loads.",
)
context_length = Flag(
    "--context-length", min=1, metavar="N", help="Advertised context length the pool must hold (default: the engine's)."
)
context_len_old = Flag("--context-len", min=1, hidden=True)  # the old spelling of --context-length
headroom = Flag("--headroom", min=1.0)
timeout = Flag("--timeout", min=0.1)
read_deadline = Flag("--read-deadline", min=0.1)
concurrency = Flag("--concurrency", default=DEFAULT_CONCURRENCY, min=1, max=4096)
probes = Flag("--probes/--no-probes", default=True)
probe_deadline = Flag("--probe-deadline", min=0.1)
tenants = Flag("--tenants", min=1)
keep_going = Flag(
    "--keep-going",
    default=False,
    help="Run every probe even after a confirmed leak or once the deployment stopped answering.",
)
deferred_release = Flag("--deferred-release/--no-deferred-release")
deferred_release_old = Flag("--deferred-release-env/--no-deferred-release-env", hidden=True)  # the old spelling
model_arch = Flag("--model-arch")
model_config = Flag("--model-config")
trust_version = Flag(
    "--trust-version", default=False, help="Let a worker's version string alone decide its fixes (no code read)."
)
site_packages = Flag("--site-packages")
python = Flag("--python")
scan_timeout = Flag("--scan-timeout", min=1.0)

# A deployment started or sized (drill, up, plan); a checkout read or patched (fixes, backport).
# A SGLang release is `--release R` on every command (`--emulate`, `--to`, `--version`: hidden old spellings).
release = Flag("--release", metavar="R")
emulate_old = Flag("--emulate", hidden=True)  # the old spelling of --release where a release is reproduced
engine = Flag("--engine")
prefill = Flag("--prefill", default=1, min=1, help="Prefill workers.")
decode = Flag("--decode", default=1, min=1, help="Decode workers.")
prefill_pool = Flag("--prefill-pool", min=1)
decode_pool = Flag("--decode-pool", min=1)
page_size = Flag("--page-size", min=1)
skip_tokenizer_init = Flag("--skip-tokenizer-init", default=False)
mem_fraction_static = Flag("--mem-fraction-static")
repo = Flag("--repo")
probe_timeout = Flag("--probe-timeout", default=300.0, min=1.0)
