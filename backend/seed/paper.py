"""The paper's reported numbers (aah_core.paper) as a read-only experiment, ``paper (reported)``.

These are the paper's figures, not ours: the runs carry ``read_only: true``, ``source: paper`` and a
``source`` param so nobody mistakes them for local results; each run's group is the preset that
reproduces it, as for the suite's runs. Differences below ~0.01 in val_loss are within the paper's
own export-to-export noise.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from aah_core import paper
from backend.store.metric_store import log_metrics
from backend.store.run_store import create_run, now_ms
from backend.store.tables import Experiment

EXPERIMENT = "paper (reported)"


def paper_runs() -> list[tuple[str, dict[str, str], dict[str, float]]]:
    """(run name, params, metrics at step 10000) for every row of Tables 1 and 2 (aah_core.paper)."""
    common = {"source": "arXiv 2608.19203 (reported by the paper, not reproduced here)", "seq_len": str(paper.SEQ_LEN),
              "model": "1b", "seed": "0", "step": str(paper.STEP)}
    runs = []
    for table, blocks, metrics in (("Table 1 (training loop)", "20", paper.table1_metrics),
                                   ("Table 2 (infer.py)", "61", paper.table2_metrics)):
        for row in paper.ROWS:
            params = {**common, "table": table, "method": row.row, "paper_label": row.label, "commit": row.commit,
                      "val_blocks": blocks}
            runs.append((f"{row.row} · {table.split(' (')[0]}", params, metrics(row)))
    return runs


def seed_paper_reference(s: Session) -> bool:
    """Create the reference experiment once; returns False when it already exists."""
    if s.scalar(select(Experiment.id).where(Experiment.name == EXPERIMENT)) is not None:
        return False
    ts = now_ms() / 1000
    for name, params, metrics in paper_runs():
        run_id = create_run(s, name=name, experiment=EXPERIMENT, status="FINISHED", params=params,
                            read_only=True, seq_len=paper.SEQ_LEN, source="paper", group=params["method"],
                            seed=int(params["seed"]))
        log_metrics(s, run_id, [(k, paper.STEP, float(v), ts) for k, v in metrics.items()])
    return True
