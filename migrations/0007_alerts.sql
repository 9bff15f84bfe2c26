-- placeholder: filled by the alerts work
SELECT 1;
