"""HTML reports and comparisons built from stored trial records (nothing is run, no torch).

    load.py        a run folder (harness tune) or bench folder -> Run: records, trial frame
    frame.py       one TrialResult dict -> one flat row; configuration labels
    headline.py    best against the study's own fp32 baseline, said plainly when missing
    effects.py     what each technique bought: leave-one-out records, or pairs of trials
    importance.py  Optuna's parameter importances: the run's journal, or rebuilt from records
    style.py       figure look, units, escaping of record text for plotly.js
    figures_perf.py, figures_study.py, figures_memory.py   the plotly figures
    environment.py devices and versions, and what differs between trials
    html.py        the page shell: plotly.js inlined once, escaping, the sortable table
    report.py      `harness report`: the study page
    compare.py     `harness compare`: studies side by side
    export.py      the trial table as a DataFrame, CSV or JSON
    cli.py         the `report` and `compare` subcommands
"""
