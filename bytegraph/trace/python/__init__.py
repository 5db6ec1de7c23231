"""Python's data model on values: attribute lookup in Python's order and stores, operators,
special-method protocols, iterators and generators, exceptions."""
