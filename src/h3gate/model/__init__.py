"""The model: embedded presets (:mod:`~h3gate.model.presets`), what a ``--h3-model`` spec names without loading it
(:mod:`~h3gate.model.spec`), checkpoint folders read and written (:mod:`~h3gate.model.checkpoint`,
:mod:`~h3gate.model.checkpoint_writer`), the factory that builds a :class:`~h3gate.model.factory.Model` with its
identity (:mod:`~h3gate.model.factory`) and the model gate's fixed input (:mod:`~h3gate.model.contract`)."""
