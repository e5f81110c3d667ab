"""Multi-query associative recall (MQAR, zoology): data, training, accuracy by distance."""
