"""The command line, at the top of the flow: `harness` and its subcommands (`main`),
`harness tune`'s flags and its checks before anything is created (`tune`,
`tune_check`), the tables `harness bench` and `harness estimate` print
(`bench_table`) and `harness strategies` (`registry_view`). It may import every
package below it; `harness tune` is the tuner's process, so cli.main and cli.tune
import no torch at module level (what needs it is imported inside the subcommand
that runs it).
"""
