"""The front end: plan text → AST (:mod:`.parse`, :mod:`.ast`) → IR (:mod:`.lower`,
:mod:`.plan`, with :mod:`.schema` reading each block's keys); :mod:`.load` reads a
file and its imports."""
