"""The Streamlit operator console (issue 4)."""
