"""The plain data every stage shares, at the bottom of the flow: the Plan and its
Layout (`plan`), typed configs read from TOML tables (`config`), HarnessError
(`errors`), sizes and durations (`units`), the values a setting may take in a search
(`space`), the prepared plan the launcher hands to the ranks (`prepared`), and the
device a plan runs on (`device`, the one module here that imports torch at module
level, used on the torch side only), and torchvision's import mended in every process
(`torchvision_ops`, installed by `import training_harness`; torch only once torchvision is
imported). It imports no other package of the repository; every other
package may import it (the table is in tests/test_architecture.py).
"""
