"""A role's harness in the audit: which profile counts its part, or why none can.

For each role :func:`role_harness_part` finds the harness it runs
(:func:`fleetctl.roledecl.role_harness`), the profile of its tool set
(:func:`fleetctl.roledecl.toolset_key`) and of the harness's default set (for the saving
that stripping gives), both from ``<blueprint>/harnesses/``:

- a role with no ``agent_command`` and no ``harness:`` runs nothing the audit could profile:
  the runner's prefix alone is measured, with the runner's shell tool, as before (a note says so);
- a role whose harness is known and profiled: the runner's prefix without the runner's shell tool
  (the harness's own tools replace it) plus the profile (:func:`fleetctl.tokens.harness.
  with_harness`);
- a role whose harness is unknown, or has no profile for its tool set: the runner's prefix only,
  reported as a **lower bound** (``incomplete``), never ``ok`` against its budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.roledecl import HarnessKind, pinned_version, role_harness, toolset_key
from fleetctl.tokens.harness import PROFILE_DIR, Profile, find_profile, with_harness


@dataclass
class RoleHarness:
    """The harness part of one role.

    Attributes:
        name: the harness's name, or ``None`` (no agent command).
        kind: what fleetctl knows about it, or ``None`` (none, or unknown).
        toolset: the role's tool set key (``default``, ``tools-Bash``...).
        profile: the profile of that tool set, or ``None``.
        default_profile: the profile of the harness's default set (same version), or ``None``.
        missing: why the harness's part is not counted (a lower bound), or ``None``.
        warnings: notes for the report.
    """

    name: str | None
    kind: HarnessKind | None
    toolset: str
    profile: Profile | None = None
    default_profile: Profile | None = None
    missing: str | None = None
    warnings: list[str] = field(default_factory=list)

    def add(self, measurement: Any, prefix_module: Any, model: str | None,
            profile: Profile | None = None) -> Any:
        """``measurement`` with the harness's part added (``profile``, default the role's);
        unchanged when there is no profile."""
        chosen = profile or self.profile
        if chosen is None:
            return measurement
        use = prefix_module.tool_use_prompt(model)
        return with_harness(measurement, chosen, use.tokens)

    def info(self) -> dict[str, Any] | None:
        """The harness's part for reports (``None`` when the role runs no harness)."""
        if self.name is None:
            return None
        p, d = self.profile, self.default_profile
        out: dict[str, Any] = {
            "name": self.name, "toolset": self.toolset,
            "version": p.version if p else None,
            "profile": f"{PROFILE_DIR}/{p.file_name}" if p else None,
            "total_tokens": p.total_tokens if p else None,
            "components": {k: v["tokens"] for k, v in p.components.items()} if p else None,
            "tools": [t["name"] for t in p.tools] if p else None,
            "default_profile": f"{PROFILE_DIR}/{d.file_name}" if d else None,
            "default_total_tokens": d.total_tokens if d else None,
            "default_tools": len(d.tools) if d else None,
            "saving_tokens": d.total_tokens - p.total_tokens if p and d else None}
        return out


def role_harness_part(blueprint: Path, role: Any) -> RoleHarness:
    """Find the harness and profiles of ``role`` in ``blueprint`` (see the module docstring).

    Raises:
        ProfileError: a profile file that matches is not a valid profile.
    """
    tools = getattr(role, "tools", None)
    toolset = toolset_key(tools)
    kind = role_harness(role)
    if kind is None:
        if not role.agent_command and not getattr(role, "harness", None):
            out = RoleHarness(None, None, toolset)
            out.warnings.append("the role has no agent_command: only the runner's part is "
                                "measured (no harness)")
            return out
        exe = Path(role.agent_command[0]).name if role.agent_command else role.harness
        return RoleHarness(exe, None, toolset, missing=(
            f"agent command {exe!r} is no harness fleetctl can profile: its own system prompt "
            "and tools are not counted"))
    version = pinned_version(role)
    profile = find_profile(blueprint, kind.name, toolset, version)
    out = RoleHarness(kind.name, kind, toolset, profile=profile)
    if profile is None:
        pinned = f" {version}" if version else ""
        out.missing = (f"no harness profile for {kind.name}{pinned} with tool set {toolset} in "
                       f"{PROFILE_DIR}/: run fleetctl tokens --probe for an agent of this role")
        return out
    out.default_profile = profile if toolset == "default" else \
        find_profile(blueprint, kind.name, "default", profile.version)
    return out
