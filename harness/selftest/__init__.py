"""`harness selftest --gpu`: the GPU path proved in one command.

Every step runs in its own subprocess (pytest, `harness bench`, `harness tune`,
`harness report`), each with a timeout and its output teed to a log; what each step
left (its record, its junit file, its run folder) is read back and written as one
markdown page. This process never touches CUDA: it learns the device from NVML, or
from a short-lived `python -c "import torch; ..."`.

    proof.py     what the GPU proof runs, in which order, and each phase's time box
    device.py    the CUDA devices here, without CUDA in this process
    plans.py     which plans fit the devices here
    runner.py    a subprocess with a timeout, teed to a log
    phases.py    each phase's steps, and selftest.json: what each ran, kept across runs
    figures.py   the figures of a bench record, a junit file and a study's trials
    markdown.py  the page
"""
