"""After the search, on the main worker: the contenders measured again in rounds, the
best's ablation, and the study's files (study.json, best.toml, the summary)."""
