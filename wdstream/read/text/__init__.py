"""The raw-text reader: text files tokenised on the fly, with the packed reader's cursor semantics."""
