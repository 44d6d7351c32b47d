"""The examples (examples/) as people use them: real uvicorn, real files, Chromium."""
