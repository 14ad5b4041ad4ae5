"""The reader: ``index.json`` -> epoch plan -> ranged sample reads -> token streams -> batches."""
