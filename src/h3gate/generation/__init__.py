"""Generation: diffusers' MiniMax-H3 pipeline over in-process components (:mod:`~h3gate.generation.pipeline`,
:mod:`~h3gate.generation.components`, the fl2va keyframe :mod:`~h3gate.generation.keyframe`), the generation contract
(:mod:`~h3gate.generation.contract`) and the default contracts of a model (:mod:`~h3gate.generation.default_contracts`),
the metrics of a clip against a reference (:mod:`~h3gate.generation.metrics`) and the resumable step store
(:mod:`~h3gate.generation.resume`)."""
