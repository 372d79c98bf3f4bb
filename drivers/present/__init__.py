"""What a run looks like outside the UI: report tables, comparisons, pictures. Imports only the model."""
