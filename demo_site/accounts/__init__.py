"""The demo's accounts: sign-up, and a message board that lets a user post once a second."""
