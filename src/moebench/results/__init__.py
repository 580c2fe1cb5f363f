"""The results document: what one run measured and decided, case by case (ResultsDoc, CaseDoc,
MetricDoc), read back field by field with one-line errors that name the file and the field.
Everything above reads runs through it; it imports only the core and the gate."""
