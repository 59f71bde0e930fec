"""Evidence: the signed record of a gate run and what reads it.

:mod:`~h3gate.evidence.statement` builds and writes the in-toto statement, :mod:`~h3gate.evidence.redaction` redacts
it, :mod:`~h3gate.evidence.signing` seals it in a DSSE envelope, :mod:`~h3gate.evidence.verify` checks it,
:mod:`~h3gate.evidence.bundle` packs it for upload, :mod:`~h3gate.evidence.merge` joins shards,
:mod:`~h3gate.evidence.accumulate` the sessions of one output folder,
:mod:`~h3gate.evidence.review` renders the reviewer's report; :mod:`~h3gate.evidence.profiles` says which gates a
run must reach a verdict on, :mod:`~h3gate.evidence.candidate_lock` which candidate it must qualify, and
:mod:`~h3gate.evidence.environment` what machine it ran on. Importing this package imports none of them.
"""
