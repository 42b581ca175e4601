"""The soak and chaos run (`python -m bench.soak.run`, `make soak`; two minutes of it in
tests/soak): run.py is the command line and one run, load.py the clients and the chaos,
measure.py the samples of the server's process tree and the verdicts' measures; models/ holds
the deliberately leaking model of its negative control."""
