"""Language modelling (the paper's Tables 1-2): Wikitext-2 data, training, perplexities."""
