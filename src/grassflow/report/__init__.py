"""Stage 5: aggregate tables (Markdown, CSV, LaTeX) and figures of a preset."""
