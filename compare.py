"""Compare evaluation runs: one self-contained HTML dashboard, PNG figures, Markdown and CSV tables.

    python compare.py /tmp/baseline_run /tmp/ties_index_run --reference baseline_run --out outputs/compare/ties
    python compare.py outputs/wandb/offline-run-*          # offline W&B runs, read locally
    python compare.py --wandb-project token-attributions --wandb-filters '{"tags": {"$in": ["ties:index"]}}'
    python compare.py RUN ... --wandb-report --wandb-project token-attributions   # also a W&B report (online)

The logic lives in :mod:`comparison` (loading runs, tables, figures, the HTML page, the W&B report); the options
are :mod:`comparison.cli`'s.
"""
from comparison.cli import main

if __name__ == "__main__":
    main()
