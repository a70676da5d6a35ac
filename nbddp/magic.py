"""The IPython side: ``%%ddp`` (and ``%load_ext nbddp``). Parses the line, checks the cell,
picks a view, runs the launch, stores the result as ``_ddp`` and raises if any rank failed."""
from __future__ import annotations

from IPython.core.magic import Magics, cell_magic, magics_class

from . import api, views
from .spec import parse_line


@magics_class
class DDPMagics(Magics):
    """``%%ddp [options] [-- script args]``: run the cell as a torchrun-style job."""

    @cell_magic
    def ddp(self, line: str, cell: str):
        spec = parse_line(line)
        if spec is None:  # -h
            return None
        api.compile_cell(cell)
        sinks = views.make_sinks(spec, self.shell)
        # The magic's own line stays line 1, so line numbers match what the notebook shows.
        source = f"# %%ddp {line.strip()}\n{cell}"
        result = api.run(source, spec=spec, sinks=sinks, check=False)
        self.shell.user_ns["_ddp"] = result
        result.raise_for_status()
        return None
