"""A run's parallel layout, to place ranks on pipeline stages and name process groups.

Written ``tp=2,pp=4[,cp=1][,dp=8][,order=tp-cp-dp-pp]``. Ranks are numbered with the first
dimension of ``order`` varying fastest, Megatron's convention (its default order is
``tp-cp-ep-dp-pp``; expert parallelism splits the same ranks again and does not move stages, so
it is not part of this layout). ``dp`` may be left out: it is then world / (tp x cp x pp).
"""

from __future__ import annotations

from dataclasses import dataclass

from attune.core.errors import ReaderError

__all__ = ["DIMS", "RankLayout", "RankLayoutError"]

DIMS = ("tp", "cp", "dp", "pp")
_DEFAULT_ORDER = ("tp", "cp", "dp", "pp")


class RankLayoutError(ReaderError, ValueError):
    """A layout string or a layout that does not fit the traces."""


@dataclass(frozen=True)
class RankLayout:
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int | None = None
    order: tuple[str, ...] = _DEFAULT_ORDER

    @classmethod
    def parse(cls, text: str) -> RankLayout:
        values: dict[str, int] = {}
        order = _DEFAULT_ORDER
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep:
                raise RankLayoutError(f"layout: expected key=value, got {part!r}")
            if key == "order":
                dims = tuple(d.strip().lower() for d in value.split("-") if d.strip())
                dims = tuple(d for d in dims if d != "ep")
                if sorted(dims) != sorted(DIMS):
                    raise RankLayoutError(f"layout: order must list each of tp, cp, dp, pp once, got {value!r}")
                order = dims
                continue
            if key not in DIMS:
                raise RankLayoutError(f"layout: unknown key {key!r} (expected tp, cp, pp, dp or order)")
            try:
                n = int(value)
            except ValueError:
                raise RankLayoutError(f"layout: {key} must be a positive integer, got {value!r}") from None
            if n < 1:
                raise RankLayoutError(f"layout: {key} must be a positive integer, got {value!r}")
            values[key] = n
        return cls(
            tp=values.get("tp", 1),
            cp=values.get("cp", 1),
            pp=values.get("pp", 1),
            dp=values.get("dp"),
            order=order,
        )

    def resolved(self, world_size: int | None) -> RankLayout:
        """Fill ``dp`` from the world size and check the sizes multiply to it."""
        model = self.tp * self.cp * self.pp
        dp = self.dp
        if dp is None:
            if world_size is None:
                raise RankLayoutError("layout: dp is not given and the traces do not say the world size")
            if world_size % model:
                raise RankLayoutError(f"layout: world size {world_size} is not divisible by tp*cp*pp = {model}")
            dp = world_size // model
        if world_size is not None and model * dp != world_size:
            raise RankLayoutError(
                f"layout: tp*cp*pp*dp = {model * dp} does not match the traces' world size {world_size}"
            )
        return RankLayout(tp=self.tp, cp=self.cp, pp=self.pp, dp=dp, order=self.order)

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * (self.dp or 1)

    def size(self, dim: str) -> int:
        return int(getattr(self, dim) or 1)

    def coords(self, rank: int) -> dict[str, int]:
        out: dict[str, int] = {}
        r = rank
        for dim in self.order:
            n = self.size(dim)
            out[dim] = r % n
            r //= n
        return out

    def stage(self, rank: int) -> int:
        return self.coords(rank)["pp"]

    def group_dim(self, ranks: list[int]) -> str | None:
        """The dimension a process group spans, if it spans one (dp with cp counts as dp)."""
        if len(ranks) < 2:
            return None
        coords = [self.coords(r) for r in ranks]
        varying = {d for d in DIMS if len({c[d] for c in coords}) > 1}
        if len(varying) == 1:
            return varying.pop()
        if varying == {"dp", "cp"}:
            return "dp"
        return None

    def as_dict(self) -> dict[str, object]:
        return {"tp": self.tp, "cp": self.cp, "pp": self.pp, "dp": self.dp, "order": "-".join(self.order)}
