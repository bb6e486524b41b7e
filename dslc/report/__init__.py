"""Presentation: diagnostics (:mod:`.diagnostics`), ``dslc explain`` (:mod:`.explain`)
and pictures of pipeline schedules (:mod:`.draw`)."""
